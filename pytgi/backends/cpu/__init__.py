"""pytgi.backends.cpu"""
