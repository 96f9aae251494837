"""Models: loading, GGUF reading, architectures, quantized weights, memory and the runners."""
