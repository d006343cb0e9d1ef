"""``{% load dispatch_rows %}`` gives ``{% dispatch_result_list cl %}``: Django's
``{% result_list cl %}`` with its rows rendered by ``admin.rows`` (same markup, cheaper)."""

from django import template

from ..admin.rows import result_list_tag

register = template.Library()
register.tag("dispatch_result_list", result_list_tag)
