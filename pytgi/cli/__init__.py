"""pytgi.cli"""
