"""pytgi.server"""
