# examples/recipes/django/signups/management/commands/create_signup_tables.py
from django.core.management.base import BaseCommand

from signups.queue import get_store


class Command(BaseCommand):
    help = "Create the signup tables beside the queue's (your migrations, in real life)."

    def handle(self, *args, **options):
        with get_store().transaction() as tx:
            tx.execute("CREATE TABLE IF NOT EXISTS signups (email TEXT PRIMARY KEY)")
            tx.execute("CREATE TABLE IF NOT EXISTS welcomes (email TEXT, job_id TEXT UNIQUE)")
