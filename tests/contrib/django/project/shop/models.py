from __future__ import annotations

from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)


class Shipment(models.Model):
    """What the ship task writes, once per run: a task that ran twice shows twice."""

    order_id = models.IntegerField()
    attempt = models.IntegerField()
