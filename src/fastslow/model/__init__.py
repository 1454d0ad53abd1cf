"""Base models (GGUF conversion, hub ids, tiny test models) and generation backends."""
