"""One agent episode: parsing model replies into actions and turning scores into rewards."""
