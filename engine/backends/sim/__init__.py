"""The landscape simulator as a model family (``--model sim``) and its save state."""
