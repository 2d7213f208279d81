"""pytgi.worker"""
