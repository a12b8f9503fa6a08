"""The console's pages, live regions and operator actions: thin function views.

Regions re-fetch themselves over htmx (on a websocket signal, on reconnect, on tab focus); each
region is served by the view of the page that owns it: an htmx GET gets the region's partial,
a plain GET the whole page. Side effects are POSTs (CSRF, login, operator role) that call one
``do_*`` action or ``start_cycle`` and answer htmx with the form's partial, plain browsers with a
redirect (success) or the page with the form's errors (status 400).

Roles: operators (group ``operators``) and superusers act; everyone else signed in sees pages with
the buttons disabled and gets 403 on POST.

One module per page, as in ``console/urls.py``; ``common`` holds what they share.
"""
