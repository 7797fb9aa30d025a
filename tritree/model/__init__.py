"""Pure functional model definitions (Kimi K2.6 target, DFlash draft): parameters are dicts of
tensors; functions take params, config and state and return outputs and new state."""
