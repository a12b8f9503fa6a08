"""``manage.py forgethostkey INSTANCE --reason R``: forget the SSH host key kept for an instance
(trust on first use, ``fleet.ssh.InstanceHostKeys``), after an operator checked that the machine
was rebuilt on purpose; the next contact keeps the key it offers then. Audited; the instance's
``ssh_host_key_changed`` alert is resolved."""

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from console.management.commands._users import cli_actor
from fleet.alerts import resolve
from fleet.audit import do_audit
from fleet.models import Instance
from fleet.ssh import fingerprint


class Command(BaseCommand):
    help = "Forget the SSH host key kept for an instance (it was rebuilt on purpose)."

    def add_arguments(self, parser):
        parser.add_argument("instance", help="the instance's id as the fleet page shows it (external id)")
        parser.add_argument("--reason", required=True, help="why the new key is trusted (goes to the audit log)")

    def handle(self, *args, instance, reason, **options):
        inst = Instance.objects.filter(external_id=instance, killed_at__isnull=True).first()
        if inst is None:
            raise CommandError(f"no live instance {instance!r}; see the fleet page for the ids")
        if not inst.ssh_host_key:
            raise CommandError(f"{instance} has no kept SSH host key; nothing to forget")
        with transaction.atomic():
            was = fingerprint(inst.ssh_host_key)
            Instance.objects.filter(pk=inst.pk).update(ssh_host_key="", ssh_host_key_at=None)
            do_audit(cli_actor(), "forget_host_key", instance, reason, {"ssh_host_key": was}, {"ssh_host_key": ""})
            resolve(f"ssh_host_key_changed:{instance}")
        self.stdout.write(f"{instance}: host key {was} forgotten; the next SSH contact keeps the key it offers")
