"""The adaptive draft length: how many tokens each sequence drafts per step."""
