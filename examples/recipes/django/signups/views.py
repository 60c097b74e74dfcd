# examples/recipes/django/signups/views.py
import json

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from signups.queue import get_store, sql


class Refused(Exception):
    pass


@csrf_exempt
@require_POST
def signup(request):
    email = json.loads(request.body)["email"]
    try:
        with get_store().transaction() as tx:  # the row and its job commit together
            tx.execute(sql("INSERT INTO signups (email) VALUES (?)"), [email])
            job = tx.jobs.enqueue("send_welcome", {"to": email})
            if email.endswith("@spam.example"):
                raise Refused("no spam")  # rolls back the row AND the job
    except Refused as exc:
        return JsonResponse({"ok": False, "error": str(exc)}, status=400)
    return JsonResponse({"ok": True, "job": job.id})
