"""The causal Wan 2.1 family's row (text to video, GPU)."""

from worldstream.engine.core.family import Family

FAMILIES = (
    Family("wan-causal", "worldstream.engine.backends.wan.backend:load_wan_backend",
           model="wan-causal", worlds=("landscape",), path_argument="model_path",
           checkpoint=True,
           summary="a Wan2.1 causal checkpoint on a GPU, with --model-path",
           hint="pass --model-path DIR holding the diffusers-format Wan2.1-T2V-1.3B base "
                "(transformer/, vae/, text_encoder/, tokenizer/) and the causal checkpoint"),
)
