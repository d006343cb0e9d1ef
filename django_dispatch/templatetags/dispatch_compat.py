"""Template tags our admin templates need on every supported Django (see ``compat``).

``{% load dispatch_compat %}`` gives ``{% csp_nonce_attr %}``: Django 6.1's
built-in tag where it exists, a stand-in with the same output on 5.2 and 6.0.
"""

from django import template

from ..compat import csp_nonce_attr

register = template.Library()
register.simple_tag(takes_context=True)(csp_nonce_attr)
