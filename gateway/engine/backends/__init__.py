"""Model backends whose keys and values live outside torch (base.py: the seam the batch path
runs them through; llamacpp.py: GGUF models on llama.cpp, imported only where one loads)."""
