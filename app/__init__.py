"""worldstream application layer: CLI, FastAPI server, Gradio UI. No engine logic here."""
