# examples/recipes/django/mysite/settings.py
import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "dev-only-not-secret")
DEBUG = False
TIME_ZONE = "UTC"
USE_TZ = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "mysite.urls"
INSTALLED_APPS = ["signups"]
MIDDLEWARE = []
DATABASES = {}  # the business rows below go through the queue's store

# jaren_jobs: where the store lives — a SQLite path or a postgresql:// URL
JAREN_JOBS_DATABASE = os.environ.get("JAREN_JOBS_DATABASE", "jobs.db")
