"""Any Gymnasium game as a world: the env made deterministic (``env``), its frames scaled to the
world's size (``frames``), its actions mapped to the page's keys (``keymap``), and recorded play
as a dataset (``policy``, ``dataset``, ``record``)."""
