"""The lab: a real small LLM (SmolLM2-135M-Instruct), re-quantized, to record real pairs.

Heavy imports (torch, transformers) live in the submodules that need them, so
``quantdrift.lab.quality`` stays cheap. The prompt set is data, in
``quantdrift.data.prompts``, so production code reads it without importing the lab.
"""
