from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from console import views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("fleet/", views.fleet_page, name="fleet"),
    path("runs/", views.runs_page, name="runs"),
    path("runs/<int:number>/", views.run_detail, name="run"),
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
