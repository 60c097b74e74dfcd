from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, JsonResponse

from .models import Order
from .tasks import ship


class Refused(Exception):
    pass


def place_order(request: HttpRequest, backend: str) -> JsonResponse:
    """Save an order and enqueue its shipping in one transaction; ``?fail=1`` rolls both back."""
    database = ship.using(backend=backend).get_backend().database
    try:
        with transaction.atomic(using=database):
            order = Order.objects.using(database).create(item=request.GET.get("item", "book"))
            result = ship.using(backend=backend).enqueue(order_id=order.pk)
            if request.GET.get("fail"):
                raise Refused
    except Refused:
        return JsonResponse({"error": "refused"}, status=400)
    return JsonResponse({"order": order.pk, "task": result.id, "status": result.status})
