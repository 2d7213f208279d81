"""pytgi.distributed"""
