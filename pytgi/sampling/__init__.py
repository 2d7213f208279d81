"""pytgi.sampling"""
