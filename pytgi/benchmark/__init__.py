"""pytgi.benchmark"""
