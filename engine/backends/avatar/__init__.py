"""The avatar family: the learned avatar world and its simulator, their save states."""
