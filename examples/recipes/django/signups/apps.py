# examples/recipes/django/signups/apps.py
from django.apps import AppConfig


class SignupsConfig(AppConfig):
    name = "signups"

    def ready(self):
        # nothing opened here: ready() runs before gunicorn --preload forks, and
        # a store used in a forked child raises StoreClosed; queue.get_store()
        # opens one per process on first use instead
        pass
