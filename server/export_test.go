package server

// HomeScore is the rendezvous score home routing ranks nodes by (tests
// pick node runs that win or lose a user).
var HomeScore = homeScore
