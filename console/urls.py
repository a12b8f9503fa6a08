from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from console import memory_views, trace_views, user_views, views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("fleet/", views.fleet_page, name="fleet"),
    path("runs/", views.runs_page, name="runs"),
    path("runs/<int:number>/", views.run_detail, name="run"),
    path("approvals/", views.approvals_page, name="approvals"),
    path("approvals/<int:pk>/decide/", views.decide_approval, name="decide_approval"),
    path("alerts/", views.alerts_page, name="alerts"),
    path("alerts/<int:pk>/ack/", views.ack_alert, name="ack_alert"),
    path("actions/", views.actions_page, name="actions"),
    path("instances/<str:external_id>/", views.instance_page, name="instance"),
    path("instances/<str:external_id>/act/", views.instance_action, name="instance_action"),
    path("api/instances/<str:external_id>/<str:action>/", views.api_instance_action, name="api_instance_action"),
    path("settings/", views.settings_page, name="settings"),
    path("traces/", trace_views.traces, name="traces"),
    path("memory/", memory_views.memory_page, name="memory"),
    path("memory/<int:pk>/edit/", memory_views.edit_fact, name="edit_fact"),
    path("memory/<int:pk>/delete/", memory_views.delete_fact, name="delete_fact"),
    path("users/", user_views.users_page, name="users"),
    path("users/add/", user_views.add_user, name="add_user"),
    path("users/<int:pk>/role/", user_views.set_role, name="set_user_role"),
    path("users/<int:pk>/active/", user_views.set_active, name="set_user_active"),
    path("actions/observe-only/", views.set_observe_only, name="set_observe_only"),
    path("actions/reset/", views.reset_session, name="reset_session"),
    path("actions/target/", views.set_target, name="set_target"),
    path("actions/message/", views.post_message, name="post_message"),
    path("actions/observe/", views.observe_now, name="observe_now"),
    path("actions/demo/enqueue/", views.demo_enqueue, name="demo_enqueue"),
    path("actions/demo/kill/", views.demo_kill, name="demo_kill"),
    path("healthz", views.healthz, name="healthz"),
    path("login/", auth_views.LoginView.as_view(template_name="console/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
]
