"""Static file finders that answer "not found" for a path outside their folders.

Django's finders join the requested path to their roots with ``safe_join``, which raises
``SuspiciousFileOperation`` for ``../`` paths (``/static/%2e%2e/%2e%2e/console/settings.py``).
Every static handler (daphne's ``ASGIStaticFilesHandler`` as ``make run`` serves it, ``runserver``,
``django.contrib.staticfiles.views.serve``) turns only ``Http404`` into a response, so that
exception became a 500 with a traceback. These finders return "no match" instead; the handler then
answers 404, and nothing outside the static folders is ever read.
"""

from django.contrib.staticfiles.finders import AppDirectoriesFinder, FileSystemFinder
from django.core.exceptions import SuspiciousFileOperation


def _none(find_all: bool, kwargs: dict) -> list:
    # what Django's own finders answer when nothing matches, whatever ``find_all`` (an empty list;
    # ``finders.find`` turns a ``None`` into a truthy ``[None]``)
    return []


class SafeFileSystemFinder(FileSystemFinder):
    """``STATICFILES_DIRS`` finder; a path that leaves its folders is not found (no exception)."""

    def find(self, path, find_all=False, **kwargs):
        try:
            return super().find(path, find_all=find_all, **kwargs)
        except SuspiciousFileOperation:
            return _none(find_all, kwargs)


class SafeAppDirectoriesFinder(AppDirectoriesFinder):
    """Each app's ``static/`` finder (the admin's); a path that leaves its folders is not found."""

    def find(self, path, find_all=False, **kwargs):
        try:
            return super().find(path, find_all=find_all, **kwargs)
        except SuspiciousFileOperation:
            return _none(find_all, kwargs)
