"""pytgi.backends"""
