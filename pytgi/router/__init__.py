"""pytgi.router"""
