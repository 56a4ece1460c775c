from dtype_doctor.cli.main import run

run()
