"""pytgi.models"""
