"""Tasks: a world's true simulator, its weight-free success judge and reference policies, plug-ins by `module:function`."""
