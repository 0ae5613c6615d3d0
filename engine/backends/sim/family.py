"""The landscape simulator's row, and the emulated GPU model's (the simulator's frames at a
published model's chunk time: scale-out measured where no accelerator is,
``engine/backends/emulated.py``)."""

from worldstream.engine.core.family import Family

FAMILIES = (
    Family("sim", "worldstream.engine.backends.sim.backend:SimBackend", model="sim",
           worlds=("landscape",), summary="the world's ground-truth simulator",
           simulator=True, prompt_encoder=True),
    Family("emulated", "worldstream.engine.backends.emulated:load_emulated_backend",
           model="emulated", worlds=("landscape",), frame_sizes=("128x128", "832x480"),
           summary="a SIMULATION of a GPU model for scale-out tests: the simulator's frames "
                   "at --frame-size, each chunk lasting a published model's time, spent "
                   "waiting",
           prompt_encoder=True),
)
