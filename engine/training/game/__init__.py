"""A game world's recipe: recording, training and its model card."""
