"""The game family: a game played by its env (``game-sim:ENV``) and its learned world
(``game-builtin:ENV``); their keys, save states and recorded play."""
