from jobdist.cli import main

main(prog_name="jobdist")
