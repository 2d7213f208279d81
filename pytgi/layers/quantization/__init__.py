"""pytgi.layers.quantization"""
