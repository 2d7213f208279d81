"""pytgi.utils"""
