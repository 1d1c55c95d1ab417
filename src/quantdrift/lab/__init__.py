"""The lab: a real small LLM (SmolLM2-135M-Instruct), re-quantized, to record real pairs.

Heavy imports (torch, transformers) live in the submodules that need them, so
``quantdrift.lab.quality`` and ``quantdrift.lab.prompts`` stay cheap.
"""
