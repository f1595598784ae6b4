"""features/checkpointing"""
