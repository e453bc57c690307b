# On top of the preset for every action config: upstream samples its action net without CFG (the actions stay in the
# uncond branch, so the prompt is all guidance would push; docs/actions.md).
guidance = 0.0
