"""The job tables in every database a JarenBackend names, and the attempts table.

The job tables are the library's own (``_jaren_jobs`` and its companions), created
and upgraded forward-only by the library itself, here as on any first open: a
Django model of them would freeze one schema version and drift from the library's
upgrades. So this migration only asks the library to create them, inside the
migration's transaction; ``manage.py migrate`` leaves a working queue.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models


def create_job_tables(apps: Any, schema_editor: Any) -> None:
    from jaren_jobs.contrib.django.settings import backend_databases  # noqa: PLC0415

    alias = schema_editor.connection.alias
    if alias in backend_databases():
        from jaren_jobs.contrib.django.stores import create_tables  # noqa: PLC0415

        create_tables(alias)


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []  # noqa: RUF012 - Django reads a plain list

    operations = [  # noqa: RUF012
        migrations.CreateModel(
            name="Attempt",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("job_id", models.CharField(max_length=200)),
                ("number", models.PositiveIntegerField()),
                ("worker_id", models.CharField(max_length=400)),
                ("started_at", models.DateTimeField()),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                (
                    "exception_class_path",
                    models.CharField(blank=True, default="", max_length=400),
                ),
                ("traceback", models.TextField(blank=True, default="")),
            ],
            options={"db_table": "_jaren_django_attempts", "ordering": ("job_id", "number")},
        ),
        migrations.AddConstraint(
            model_name="attempt",
            constraint=models.UniqueConstraint(
                fields=("job_id", "number"), name="jaren_attempt_once"
            ),
        ),
        migrations.RunPython(create_job_tables, migrations.RunPython.noop, elidable=False),
    ]
