"""features/longhaul"""
