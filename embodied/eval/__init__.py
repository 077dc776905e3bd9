"""Every evaluation path: episodes and their report (`episodes`), benchmark suites
(`suites`) and the evaluation during training (`periodic`). `embodied eval` is the verb."""
