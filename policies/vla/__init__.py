"""The built-in vision-language-action policies, trained here from scratch or from a language
backbone: the flow VLA on frozen pretrained encoders, a transformers VLM with a flow action
expert, and the token VLA that speaks actions as tokens of a causal LM or VLM."""
