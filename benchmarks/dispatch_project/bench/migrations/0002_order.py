from django.db import migrations, models
from django.db.models.functions import Now


class Migration(migrations.Migration):
    dependencies = [("bench", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("seq", models.IntegerField()),
                ("status", models.CharField(max_length=16)),
                ("updated_at", models.DateTimeField(db_default=Now())),
            ],
            options={"managed": False, "db_table": "bench_order"},
        ),
    ]
