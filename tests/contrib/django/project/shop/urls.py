from __future__ import annotations

from django.urls import path

from .views import place_order

urlpatterns = [path("orders/<str:backend>", place_order)]
