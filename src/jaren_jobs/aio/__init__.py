"""The asyncio front door (SPEC §11): the same file names as the sync one."""
