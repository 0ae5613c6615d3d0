"""The built-in procedural world: simulator, scenes, actions, episode recorder."""
