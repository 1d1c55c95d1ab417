"""The demo: a quantized route rolled back on the embedded broker and Redis."""
