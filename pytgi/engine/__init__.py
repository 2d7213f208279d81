"""pytgi.engine"""
