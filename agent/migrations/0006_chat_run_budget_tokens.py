from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agent', '0005_merge_llm_memory'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='budget_tokens',
            field=models.PositiveIntegerField(default=0),
        ),
    ]
