"""pytgi.layers"""
